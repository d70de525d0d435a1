"""The aws backend's calls to the cloud: everything that calls the EC2/IAM API. ec2 (the control plane: images,
subnets, launch templates, instance profiles), groups (a sweep's security group per region and a remote controller's
SSH rules), fleet (CreateFleet and its error classes; pools.py: the choices and which are blocked), placement
groups, teardown, images (orch's AMIs: find, list, remove), iam and policy (instance profiles, the IAM policy and
boundary `orch aws` prints), pricing (spot and on-demand prices, the cost ledger), worth (a pool's expected $ per
unit of work), scores (AWS's Spot placement scores), gpus, controller_host (a remote controller's instance), and the
user data instances boot with.

The only package that creates EC2/IAM clients (the host's own EC2 calls are host/aws/). Imports `sweep`, `store`,
`contract`, `errors`, `wait`; never the rest of `backends`, nor `control`, `host`, `remote` or `cli`. Outside
`backends/aws/`, only the registry's aws entry (its cost reader, its errors in words) and the aws backend's own
commands (cli/aws.py, cli/ami.py, cli/remote.py) import it (import-linter checks both).
"""
