"""The OpenAI-compatible training endpoint for external agents (issue 36), built in slices. In main so far:
`episode.py`, the exact-token bookkeeping of one episode's calls (continuation rows and new segments). The HTTP
server, the harness runner (`--rollout.agent`, `--rollout.agent-cmd`) and the trainer's use of them come next."""
