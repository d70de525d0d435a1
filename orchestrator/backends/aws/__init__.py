"""The AWS backend: spot instances acquired with CreateFleet (`backend`, composing the parts below over one explicit
`state.ProvisioningState`), the sweep's resources created once (`setup`), provisioned over SSH in worker threads
(`provision`; a bought instance's boot, which ends when the instance does: `boot`), shared by several runs when they
fit on one instance (`pack`), listed as hosts (`listing`; what a controller that died had bought: `adopt`; what each
run was bought as, for `deadline:`: `bought`; what earlier sweeps in the store measured: `earlier`); and image builds
(`image_build`, `orch ami build`), which launch and provision a builder the same way.

Composes `cloud/` (every EC2/IAM call: the subpackage below it, which imports nothing of the rest), `remote`
(SSH), `host` (what the agent expects; its host-side parts, which it switches on in its tasks, are host/aws/) and
`sweep`.
"""
