"""A run directory: ``directory`` (what it holds, its lock, its record, where outputs may go),
``checkpoint`` (atomic safetensors checkpoints, no pickle) and ``load`` (a trained model from
it)."""
