"""Pure functions from (spec, observed children) to desired child objects and status; no API calls."""
