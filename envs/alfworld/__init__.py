"""Parts of alfworld_lite: room data and layout/task generation (`world`). The env itself is
`envs.alfworld_lite.AlfWorldEnv`."""
