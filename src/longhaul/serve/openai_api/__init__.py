"""The OpenAI-compatible API: protocol, chat rendering, logprobs, routes."""
