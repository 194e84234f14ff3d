"""leapvox model assets: catalog, loading checkpoint folders, recipes."""
