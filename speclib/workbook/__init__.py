"""The workbook around the studies: notebooks run headlessly (RESULTS modes, steps and provenance),
committed results, the README report, plotting, the book and Ray sweeps."""
