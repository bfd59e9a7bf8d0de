"""Parts of webshop_lite: the generated catalogue and goals (`catalog`), retrieval and the purchase reward
(`engine`). The env itself is `envs.webshop_lite.WebShopEnv`."""
