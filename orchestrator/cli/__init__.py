"""The `orch` command: click commands (`main`, `runs`, `ami`, `ops`), their shared helpers (`common`) and the
rendering of tables and reports (`render`).

The only package that prints. Nothing imports it. Heavy modules are imported inside commands, so
`orch --help` stays instant.
"""
