"""The key ring in the database (revision 0009): registry, counts, re-encryption."""
