"""Toy OpenEnv environments for the tests, served by `openenv-core`'s own `create_app`.

- `app`: a digit-guessing game (text action `message`): the hidden digit comes from the reset's seed; each guess gets
  "higher" / "lower", and `score(guess, digit)` as its reward; the episode ends on the digit or after 2 guesses.
  Concurrent sessions allowed (64). A guess of "hang" sleeps, "die" kills the server: the tests' faults.
- `single_app`: the same game, OpenEnv's default of one session a server.
- `tool_app`: an `MCPEnvironment` whose tool `guess(digit)` plays the same game.
- `garbled_app`: a server that speaks the protocol for reset and answers a step with text that is not JSON.
"""

from __future__ import annotations

import os
import re
import time

from fastapi import FastAPI, WebSocket
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    prompt: str = ""


def digit_of(seed: int | None) -> int:
    return ((seed or 0) * 7 + 3) % 10


def score(text: str, digit: int) -> float:
    """1 for the digit, 0.1 for another digit, 0 for a reply without one."""
    found = re.search(r"\d", text)
    return 0.0 if found is None else 1.0 if int(found.group()) == digit else 0.1


class GuessEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.digit = State(episode_id=None, step_count=0), 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self._state, self.digit = State(episode_id=episode_id, step_count=0), digit_of(seed)
        return GuessObservation(prompt="Guess the hidden digit (0-9). Reply with one digit.")

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        if action.message == "hang":
            time.sleep(600)
        if action.message == "die":
            os._exit(3)
        self._state.step_count += 1
        reward = score(action.message, self.digit)
        found = re.search(r"\d", action.message)
        hint = "no digit" if found is None else "higher" if int(found.group()) < self.digit else "lower"
        done = reward == 1.0 or self._state.step_count >= 2
        return GuessObservation(prompt=f"Not it: {hint}. Guess again.", reward=reward, done=done)

    @property
    def state(self) -> State:
        return self._state


class SingleGuessEnv(GuessEnv):
    SUPPORTS_CONCURRENT_SESSIONS = False


app = create_app(GuessEnv, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)
single_app = create_app(SingleGuessEnv, GuessAction, GuessObservation, env_name="guess1")


class ToolGuessEnv(MCPEnvironment):
    def __init__(self):
        from fastmcp import FastMCP

        mcp = FastMCP("guess")

        @mcp.tool
        def guess(digit: int) -> str:
            """Guess the hidden digit."""
            return "right" if digit == self.digit else "higher" if digit < self.digit else "lower"

        super().__init__(mcp)
        self._state, self.digit = State(episode_id=None, step_count=0), 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> Observation:
        self._state, self.digit = State(episode_id=episode_id, step_count=0), digit_of(seed)
        return GuessObservation(prompt="Find the digit with the guess tool.")

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:
        return Observation(done=True)

    def step(self, action, timeout_s=None, **kwargs):
        return self._judge(super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action, timeout_s=None, **kwargs):  # the server calls this one
        return self._judge(await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _judge(self, obs):
        if isinstance(obs, CallToolObservation):
            self._state.step_count += 1
            right = obs.tool_name == "guess" and obs.error is None and "right" in repr(obs.result)
            obs.reward, obs.done = (1.0 if right else 0.0), right or self._state.step_count >= 3
        return obs

    @property
    def state(self) -> State:
        return self._state


tool_app = create_app(ToolGuessEnv, CallToolAction, CallToolObservation, env_name="tool_guess")


def _garbled():
    garbled = FastAPI()

    @garbled.get("/health")
    def health():
        return {"status": "healthy"}

    @garbled.get("/schema")
    def schema():
        return {"action": GuessAction.model_json_schema(), "observation": {}, "state": {}}

    @garbled.websocket("/ws")
    async def ws(websocket: WebSocket):
        await websocket.accept()
        while True:
            message = await websocket.receive_json()
            if message["type"] == "reset":
                obs = {"observation": {"prompt": "Guess."}, "reward": None, "done": False}
                await websocket.send_json({"type": "observation", "data": obs})
            elif message["type"] == "step":
                await websocket.send_text("{this is not json")
            else:
                return

    return garbled


garbled_app = _garbled()
