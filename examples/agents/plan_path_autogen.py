"""The Plan-Path team as an AutoGen AgentChat team (``autogen-agentchat`` + ``autogen-ext[openai]``;
docs/agent-programs.md), run as a command.

AutoGen pins protobuf 5, which verl's environment has outgrown, so this program lives in an
environment of its own (``make install-autogen`` builds ``.venv-autogen``: AutoGen and this package
without its dependencies; the puzzle needs none) and runs as the recipe's ``program.command``. It
reads its session from ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``PETTINGLLMS_TASK_FILE`` and
prints each agent's reward and whether the puzzle was solved as JSON on its last line.

A ``RoundRobinGroupChat`` of two agents, ``tool`` then ``plan``, each with an
``OpenAIChatCompletionClient`` whose ``model`` names the agent; the chat ends when the puzzle does
(solved or out of turns). Each agent is asked the puzzle's prompt for it and its reply is the
puzzle's step. The puzzle, its sandbox and its prompts are ``PlanPathEnv``'s, as in plan_path_openai.py.

Train it (from the repository root, after ``make install-autogen``):
    python -m verl.trainer.main_ppo --config-name plan_path_program_cpu '~pettingllms.program.target' \\
        '+pettingllms.program.command=[.venv-autogen/bin/python,examples/agents/plan_path_autogen.py]'
"""

import asyncio
import json
import os
from collections.abc import Sequence

from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.conditions import FunctionalTermination
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core import CancellationToken
from autogen_core.models import AssistantMessage, ModelInfo, SystemMessage, UserMessage
from autogen_ext.models.openai import OpenAIChatCompletionClient

from pettingllms_verl.envs.plan_path.env import PlanPathEnv

AGENTS = ("tool", "plan")
# a model AutoGen does not know must say what it can do: plain text in, plain text out
TEXT_ONLY = ModelInfo(vision=False, function_calling=False, json_output=False, family="unknown", structured_output=False)


def autogen_messages(messages: list[dict]) -> list:
    """The puzzle's chat messages as AutoGen's (a user message's ``source`` is left out of the request)."""
    kinds = {
        "system": lambda text: SystemMessage(content=text),
        "user": lambda text: UserMessage(content=text, source="user"),
        "assistant": lambda text: AssistantMessage(content=text, source="assistant"),
    }
    return [kinds[message["role"]](message["content"]) for message in messages]


class PuzzleAgent(BaseChatAgent):
    """An agent asked the puzzle's prompt for its role; its reply is that role's step."""

    def __init__(self, name: str, puzzle: PlanPathEnv, earned: list[float]):
        super().__init__(name, description=f"the Plan-Path {name} agent")
        self.puzzle, self.earned = puzzle, earned
        self.model = OpenAIChatCompletionClient(model=name, base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"],
                                                model_info=TEXT_ONLY, max_retries=0, include_name_in_message=False)

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

    async def on_messages(self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken) -> Response:
        result = await self.model.create(autogen_messages(self.puzzle.observation(self.name)), cancellation_token=cancellation_token)
        self.earned.append(self.puzzle.step(self.name, result.content).local_reward)  # the tool's program runs in the sandbox here
        return Response(chat_message=TextMessage(content=result.content, source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        pass


async def team(task: dict) -> dict:
    puzzle = PlanPathEnv(**task["env_kwargs"])
    puzzle.reset(task["seed"], task["task"])
    earned: dict[str, list[float]] = {agent: [] for agent in AGENTS}
    agents = [PuzzleAgent(agent, puzzle, earned[agent]) for agent in AGENTS]
    chat = RoundRobinGroupChat(agents, termination_condition=FunctionalTermination(lambda _messages: puzzle.done))
    try:
        await chat.run(task="Solve the Plan-Path puzzle.")
    finally:
        for agent in agents:
            await agent.model.close()
    per_agent = {agent: puzzle.global_reward + sum(rewards) / len(rewards) for agent, rewards in earned.items()}
    return {"reward": per_agent, "success": puzzle.success}  # solved is the puzzle's word, not a reward threshold


if __name__ == "__main__":
    with open(os.environ["PETTINGLLMS_TASK_FILE"]) as file:
        result = asyncio.run(team(json.load(file)))
    print(json.dumps(result))
