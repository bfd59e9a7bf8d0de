"""textarena: TextArena's single-player games as multi-turn episodes (43 of its 59 run offline here).

    torchrun --nproc_per_node 2 run.py --env textarena --env-kwargs.game GuessTheNumber-v0 --rollout.max-turns 12

Each episode is one game, `reset(num_players=1, seed=episode seed)`. What the game says between two moves (its
messages since the last move, the echo of the move itself left out) becomes one user turn; the opening turn is the
game's prompt. The game runs as TextArena registers it under `<game>-raw` (no observation wrapper: the wrappers
re-send the whole history as one string every turn, which a chat already holds). An invalid move is the game's
own observation ("You attempted an invalid move ..."), never an exception. The episode's reward is the game's
reward at the end (`close()`), on the last step; success is a reward of 1 or more (a win). A game the policy
leaves unfinished (the turn or token budget ran out) scores 0. `--env-kwargs.reward win` pays a win 1 and anything
else 0: some games pay partial credit that RL learns to farm (GuessTheNumber pays an invalid move the closeness of
the last guess; docs/experiments/warm_starts.md).

`--algo sft` trains on a scripted player's games where one is written (`EXPERTS`: GuessTheNumber's binary search on
the game's hints, for each of its variants).

Games that need a download (nltk's word lists), an API key (OpenRouter opponents) or files TextArena does not
ship, multi-player games, and games that do not import on this Python are refused at start-up, in one line that
says which.
"""

from __future__ import annotations

import functools
import os

from envs.base import Env, Message, NoExpert, StepResult
from envs.ecosystem import require

MAX_TURNS = 30  # the policy's moves per game unless --rollout.max-turns says otherwise; games stop earlier
OFFLINE = tuple(
    """
2048-v0 2048-v0-10x10 2048-v0-3x3 2048-v0-5x5 2048-v0-6x6 2048-v0-8x8 2048-v0-easy 2048-v0-extreme
2048-v0-hard 2048-v0-mega-easy 2048-v0-super-easy 2048-v0-ultra-easy 2048-v0-very-easy 2048-v0-very-hard
Bandit-v0 Bandit-v0-hard Blackjack-v0 Blackjack-v0-long Countdown-v0 Crosswords-v0 Crosswords-v0-hardcore
Cryptarithm-v0 FifteenPuzzle-v0 FrozenLake-v0 FrozenLake-v0-hardcore FrozenLake-v0-random GuessTheNumber-v0
GuessTheNumber-v0-hardcore LightsOut-v0 LogicPuzzle-v0 LogicPuzzle-v0-hard Mastermind-v0
Mastermind-v0-extreme Mastermind-v0-hard Minesweeper-v0 Minesweeper-v0-hard Minesweeper-v0-medium
Minesweeper-v0-small PegJump-v0 RushHour-v0 Secretary-v0 Secretary-v0-long Set-v0 Slitherlink-v0 Sokoban-v0
Sokoban-v0-medium Sudoku-v0 Sudoku-v0-easy Sudoku-v0-hard Sudoku-v0-medium Sudoku-v0-very-easy
ThreeCardMonte-v0 TowerOfHanoi-v0 TowerOfHanoi-v0-extreme TowerOfHanoi-v0-hard TowerOfHanoi-v0-hardcore
TowerOfHanoi-v0-medium
""".split()
)
"""The single-player games that start offline here (textarena 0.7.4, Python 3.11; a trial reset of every
registered id): what an unknown game's error lists."""
NLTK_GAMES = tuple(
    "Codenames DontSayIt Hangman LetterAuction SpellingBee WordChains WordLadder WordSearch Wordle".split()
)
"""Games that load nltk's word list when imported: without the corpus on disk they are refused before their import,
which would try to download it."""
KEY_GAMES = ("Debate", "GuessWho", "ScenarioPlanning", "TwentyQuestions")  # an OpenRouter model plays a part


def _guess_the_number(game) -> str:
    """A binary search on the game's own hints ("higher" / "lower" after each guess): what the player was told,
    nothing more."""
    lo, hi = game.min_number, game.max_number
    for guess, hint in game.state.game_state["guess_history"]:
        lo, hi = (guess + 1, hi) if hint == "higher" else (lo, guess - 1)
    return f"[{(lo + hi) // 2}]"


EXPERTS = {"GuessTheNumber": _guess_the_number}
"""Scripted players (`expert_action`), by game name: each plays every variant of its game (`-v0`, `-hardcore`)."""


def _base(game: str) -> str:
    """A game id's name without its version and variant: what `EXPERTS`, `NLTK_GAMES` and `KEY_GAMES` list."""
    return game.split("-v")[0]


def _registry() -> dict:
    return require("textarena").envs.registration.ENV_REGISTRY


def _why(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    if isinstance(e, LookupError) and "Resource" in msg:
        name = msg.split("Resource", 1)[1].split("not found")[0].strip(" '\"")
        return f"needs an nltk download ({name!r}), which this machine cannot fetch"
    if "API key" in msg or "API_KEY" in msg:
        return f"needs an API key ({msg[:120]})"
    if isinstance(e, FileNotFoundError):
        return "needs files TextArena does not ship"
    if isinstance(e, (SyntaxError, ImportError)):
        return f"does not import on this Python ({type(e).__name__}: {msg[:100]})"
    if "player" in msg.lower():
        return f"is not a single-player game ({msg[:100]})"
    return f"failed to start ({type(e).__name__}: {msg[:120]})"


@functools.lru_cache(maxsize=64)
def refusal(game: str) -> str | None:
    """Why `game` cannot be played here, or None (a trial reset; cached per process)."""
    if game not in _registry():
        return "unknown game"
    base = _base(game)
    if base in NLTK_GAMES and not _nltk_words():
        return "needs an nltk download ('words'), which this machine cannot fetch"
    if base in KEY_GAMES and not os.environ.get("OPENROUTER_API_KEY"):
        return "needs an API key (OPENROUTER_API_KEY: an OpenRouter model plays a part)"
    try:
        env = require("textarena").make(_raw(game))
        env.reset(num_players=1, seed=0)
        env.get_observation()
    except Exception as e:  # noqa: BLE001 - whatever the game raises, it is refused by name
        return _why(e)
    return None


def _nltk_words() -> bool:
    try:
        import nltk

        nltk.data.find("corpora/words")  # looks on disk only
        return True
    except (ImportError, LookupError):
        return False


def _raw(game: str) -> str:
    return game if game.endswith("-raw") or f"{game}-raw" not in _registry() else f"{game}-raw"


def _text(messages) -> str:
    """The game's messages since the last move, its echo of the move left out."""
    ta = require("textarena")
    return "\n".join(str(m[1]) for m in messages if m[0] == ta.GAME_ID or m[2] != ta.ObservationType.PLAYER_ACTION)


class TextArenaEnv(Env):
    """One single-player TextArena game. train: seed = the game's seed; test: seeds 10^9 + seed (never trained)."""

    name = "textarena"
    max_turns = MAX_TURNS

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        game: str | None = None,
        max_turns: int = MAX_TURNS,
        system_prompt: str | None = None,
        reward: str = "game",
    ):
        if not game:
            raise ValueError("textarena needs --env-kwargs.game ID, e.g. GuessTheNumber-v0")
        if (why := refusal(game)) is not None:
            if why == "unknown game":
                raise ValueError(f"textarena: unknown game {game!r}; single-player games here: {', '.join(OFFLINE)}")
            raise ValueError(f"textarena game {game!r} {why}")
        if reward not in ("game", "win"):
            raise ValueError(
                f"textarena: reward {reward!r}: expected 'game' (the game's own) or 'win' (1 a win, else 0)"
            )
        self.game, self.max_turns, self.system_prompt, self.reward = game, int(max_turns), system_prompt, reward
        self.game_seed = seed if split == "train" else 1_000_000_000 + seed
        self.split, self.seed, self.env, self.done, self.steps = split, seed, None, False, 0

    def reset(self) -> list[Message]:
        self.env = require("textarena").make(_raw(self.game))
        self.env.reset(num_players=1, seed=self.game_seed)
        _, messages = self.env.get_observation()
        self.done, self.steps = False, 0
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return head + [{"role": "user", "content": _text(messages)}]

    def step(self, action: str) -> StepResult:
        self.steps += 1
        try:
            done, _ = self.env.step(action if isinstance(action, str) else "")
        except Exception as e:  # noqa: BLE001 - a game that trips on a move: the move is invalid, the game over
            return self._end(f"The game could not take that move ({type(e).__name__}: {e}).", error=True)
        if done:
            return self._end()
        _, messages = self.env.get_observation()
        return StepResult([{"role": "user", "content": _text(messages)}], 0.0, False, {"success": False})

    def _end(self, note: str | None = None, error: bool = False) -> StepResult:
        self.done = True
        try:
            rewards, game_info = self.env.close()
        except Exception:  # noqa: BLE001
            rewards, game_info = {}, {}
        reward = 0.0 if error else float((rewards or {}).get(0, 0.0))
        success = reward >= 1.0
        if self.reward == "win":  # no partial credit: GuessTheNumber pays an invalid move the last guess's closeness
            reward = float(success)
        mine = (game_info or {}).get(0, {})
        info = {
            "success": success,
            "game_info": {k: v for k, v in mine.items() if isinstance(v, (str, int, float, bool))},
            "env_metrics": {"invalid_move": float(bool(mine.get("invalid_move"))), "turns": float(self.steps)},
        }
        if note:
            info["note"] = note
        return StepResult([], reward, True, info)

    @classmethod
    def expert_refusal(cls, game: str | None = None, **kwargs) -> str | None:
        """A game has a scripted player where `EXPERTS` lists its name."""
        if game is None or _base(game) in EXPERTS:
            return None
        having = ", ".join(g for g in OFFLINE if _base(g) in EXPERTS)
        return f"textarena: no scripted expert for {game!r}; games with one: {having}"

    def expert_action(self) -> str:
        """The game's scripted player's next move (`--algo sft`'s demonstration). The test split is never
        demonstrated; a game without a player is refused in one line."""
        if self.split != "train":
            raise NoExpert("textarena: no expert on the test split (its games are held out)")
        if (why := self.expert_refusal(game=self.game)) is not None:
            raise NoExpert(why)
        if self.env is None:
            raise ValueError("textarena: expert_action before reset")
        return EXPERTS[_base(self.game)](self.env)

    def close(self) -> None:
        self.env = None
