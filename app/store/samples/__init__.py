"""The console's minute samples (revision 0011, docs/design.md decision 8)."""
