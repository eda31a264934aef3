"""Erasure on request (revision 0009): its protocol, statements and methods."""
