"""Commands that make model assets: spec offsets and trees, windowed adaptation, Core ML exports, the demo model."""
