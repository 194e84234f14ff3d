"""leapvox: what a person touches (CLI, TUI, audio files)."""
