"""The `orch` command: the group (`main`), one module per command or family of commands (`launch`, `status`,
`runs`, `ops`, `ami`, `board`, `remote`), their shared helpers (`common`) and the rendering of tables and reports
(`render`).

The only package that prints. Nothing imports it. `main` imports a command's module only when that command
runs (click's lazy subcommands), so the modules import what they need at the top and `orch --help` stays instant.
"""
