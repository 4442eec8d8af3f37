"""The `operators` stage: which ATen operators the model needs, and whether the pool has them.

`run` is the stage; `features` maps an operator back to the model feature that used it;
`manifests/` holds the operator-manifest format and an example.
"""
