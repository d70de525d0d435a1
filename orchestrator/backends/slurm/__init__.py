"""The slurm backend (`backend: slurm`): each run a job of the user's Slurm cluster (settings.py, commands.py,
script.py, backend.py)."""
