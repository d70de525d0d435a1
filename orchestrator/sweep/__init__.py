"""sweep.yaml -> runs: the spec models (extra="forbid", spec.py), their expansion into runs (expand.py: grid x
seeds, ids, commands), cross-field checks, YAML errors with file:line, loading, run shapes (`resources:`,
`{torchrun}`), the packing plan, image recipes, and the task of one attempt as its host needs it.

Pure: reads files, touches no cloud, no store and no host. Imports only `orchestrator.contract` and
`orchestrator.errors` (and pydantic, yaml).
"""
