"""What a team program's run is given: the variables in its environment. The one owner of these names,
below every other room of ``programs/`` (the run's side, ``runner``, and the launching side, ``program``)."""

BASE_URL_VARIABLE = "OPENAI_BASE_URL"  # the run's gateway URL, as the OpenAI clients read it
API_KEY_VARIABLE = "OPENAI_API_KEY"  # the run's key at the gateway
TASK_VARIABLE = "PETTINGLLMS_TASK_FILE"  # the path of a JSON file holding the task


def run_variables(base_url: str, api_key: str, task_file: str) -> dict[str, str]:
    """A run's environment variables."""
    return {BASE_URL_VARIABLE: base_url, API_KEY_VARIABLE: api_key, TASK_VARIABLE: task_file}
