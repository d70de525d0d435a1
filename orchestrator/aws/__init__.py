"""Everything that calls the EC2/IAM API: ec2 (the control plane: images, subnets,
launch templates, instance profiles), groups (a sweep's security group per region and a remote controller's SSH
rules), fleet (CreateFleet and its error classes), placement groups,
teardown, images (orch's AMIs: find, list, remove), pricing (spot and on-demand prices, the cost
ledger), and the user data instances boot with.

The only package that creates EC2/IAM clients. Imports `sweep`, `store`, `contract`, `errors`, `wait`;
never `backends`, `control`, `host`, `remote` or `cli`.
"""
