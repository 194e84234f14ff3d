"""Recipes: the offline work behind leapvox assets (training, calibration, Core ML export, the demo model).

Nothing the runtime (leapvox.models.load / hub / catalog / checkpoint ...) imports lives here."""
