"""Target hidden states from vLLM: the extraction server, offline shards, and the streaming source."""
