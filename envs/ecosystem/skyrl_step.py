"""One SkyRL-Gym step in a sandboxed process (`SkyRLGymEnv` with `sandboxed`): a row's env class is made, initialised
with the row's prompt and stepped once with the action; the step's observations, reward, done and metadata are
printed after a marker line, so that whatever the env itself prints comes before it. Reads one JSON object on stdin:
{"cls", "config", "row", "action"}. Run by path (`python skyrl_step.py`), not as part of the `envs` package: the
sandbox's process imports SkyRL-Gym and OmegaConf only."""

import json
import sys

MARK = "@@nanosky@@"


def main() -> None:
    import skyrl_gym
    import skyrl_gym.envs  # noqa: F401 - registers SkyRL-Gym's own classes
    from omegaconf import OmegaConf

    a = json.loads(sys.stdin.read())
    env = skyrl_gym.make(a["cls"], env_config=OmegaConf.create(a["config"]), extras=a["row"])
    env.init(a["row"]["prompt"])
    out = env.step(a["action"])
    print(
        "\n" + MARK + json.dumps({k: out.get(k) for k in ("observations", "reward", "done", "metadata")}, default=repr)
    )


if __name__ == "__main__":
    main()
