"""Code that runs inside the eagle3-operator's pods, and the local `eagle3 pipeline`.

Importing this package must stay cheap (no torch): the operator imports
`eagle3_runtime.layout` for the workspace layout and stage-result schema.
"""
