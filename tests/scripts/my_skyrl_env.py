"""A user's SkyRL-Gym env, registered with skyrl_gym.register as SkyRL's docs show: `--plugins my_skyrl_env` makes
it a valid `env_class` for `--env skyrl_gym` (tests/unit/test_ecosystem_envs.py)."""

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class EchoTwiceEnv(BaseTextEnv):
    """Two turns: say the row's word, then say it again; reward 0.5 a turn."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        self.word, self.max_turns = extras["reward_spec"]["ground_truth"], 2

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        reward = 0.5 if self.word in action else 0.0
        done = self.turns >= self.max_turns
        obs = [] if done else [{"role": "user", "content": "Again."}]
        return BaseTextEnvStepOutput(observations=obs, reward=reward, done=done, metadata={"turn": self.turns})


if "echo_twice" not in skyrl_gym.registry:
    skyrl_gym.register(id="echo_twice", entry_point=EchoTwiceEnv)
