"""A bot's destinations: the downstream services its updates go to, each with its own filter
and delivery settings (docs/destinations.md, docs/design.md decision 7)."""
