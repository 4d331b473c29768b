"""Entry framing, below both the client and the bookie: the wire encoding (`encoding`), entries
prepared for an AddRequest (`prepare`) and the checks of entries read back (`verify`)."""
