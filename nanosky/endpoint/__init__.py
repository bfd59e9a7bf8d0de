"""The OpenAI-compatible training endpoint for external agents (`--rollout.agent`, `--rollout.agent-cmd`;
docs/agents.md):

    episode.py     the exact tokens of one episode's calls: append-only calls continue a row, others segment
    server.py      /v1/chat/completions, /v1/models, /health over the engine, a key per episode, tool calls both
                   ways, streaming (server-sent events)
    schema.py      the request schema (pydantic): a malformed request is a 400 naming the field
    http.py        aiohttp.web under it, on the rank's one event loop (the engine's)
    harness.py     the Player for external agents: a rank's episodes, a bounded number at once (agent_task.py:
                   what the agent is given; command.py: agent-cmd)
    rows.py        an episode's segments as the trainer's Trajectory
"""
