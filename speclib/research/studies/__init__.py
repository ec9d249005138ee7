"""What each numbered notebook computes, one module per study, so a notebook cell only calls speclib."""
