"""`localinfer serve`: an OpenAI-compatible endpoint, a thin client of the Engine."""
