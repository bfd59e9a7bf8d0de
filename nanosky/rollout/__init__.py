"""The generation side: the colocated vLLM engine, the env worker pools, this rank's rollout through the agent loop
(`collect`), step-wise sample windows, constrained sampling and chat rendering. Nothing here trains."""
