"""The peer suite's vLLM side: vLLM's scheduler scenarios, the fixtures recorded from its real scheduler, their generator and latroute's replay of them."""
