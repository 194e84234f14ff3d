"""Empty stand-in: imported by qwen_tts (25 Hz tokenizer path) at import time, never used by the 12 Hz path."""
