"""Client works: local training variants (BLUR, LUS, ...)."""
