"""One APIRouter per dialect; each translates its wire format to the Engine's requests and
events through the bridge, and nothing else."""
