"""The OpenAI-compatible training endpoint for external agents (issue 36), built in slices. In main so far:
`episode.py`, the exact-token bookkeeping of one episode's calls (continuation rows and new segments); `server.py`,
the endpoint itself (`/v1/chat/completions`, `/v1/models`, a key per episode, tool calls both ways, retries recorded
once) over any token-in backend; `http.py`, the small asyncio HTTP server under it. The harness runner
(`--rollout.agent`, `--rollout.agent-cmd`) and the trainer's use of them come next."""
