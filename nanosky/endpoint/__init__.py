"""The OpenAI-compatible training endpoint for external agents (`--rollout.agent`, `--rollout.agent-cmd`;
docs/agents.md):

    episode.py     the exact tokens of one episode's calls: append-only calls continue a row, others segment
    server.py      /v1/chat/completions and /v1/models over the engine, a key per episode, tool calls both ways
    http.py        the small asyncio HTTP server under it
    host.py        the endpoint's own thread for the run; generation handed to the rollout loop's engine
    harness.py     the agent plays a rank's episodes (agent_task.py: what it is given; command.py: agent-cmd)
    rows.py        an episode's segments as the trainer's Trajectory
"""
