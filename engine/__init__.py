"""leapvox engine: networks, sampling, decoding loops. No files or network access."""
