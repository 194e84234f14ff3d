"""The Apple Neural Engine backend (Core ML): imported only when `--backend ane` is used."""
