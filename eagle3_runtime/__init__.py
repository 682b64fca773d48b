"""Code that runs inside the eagle3-operator's pods, and the local `eagle3 pipeline`.

What it shares with the operator (workspace layout, stage results, progress, stage commands)
lives in `eagle3_api`; this package imports the operator's code nowhere, nor does the operator
import this one.
"""
