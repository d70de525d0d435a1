"""The host-side parts only the aws backend switches on, on an EC2 instance: IMDSv2 and terminating itself (imds),
the instance's own tags (tags: a packed run's slot tag, a `prune:` run's rung tags) and the register of slots of an
instance shared by several runs (slots, packing).

The generic agent (host/) imports them; each asks EC2 only when its task says so (`RunTask.host_parts`, `slot`).
Shipped with the rest of host/ in the code bundle; like host/, it imports nothing from `control`, `cli`, `backends`,
`remote` or `sweep`.
"""
