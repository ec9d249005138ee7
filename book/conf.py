"""Sphinx configuration of the speclib book (`make book`, `python -m speclib book`).

The book is built from a staging folder that `speclib.workbook.book` fills: this file, index.md, the maths
pages of docs/ and the notebooks as papermill executed them. Nothing is executed again here
(`nb_execution_mode = "off"`), and every asset, MathJax included, is served from the built folder,
so the book opens from any static file server with no network.
"""
project = "speclib"
author = "the speclib authors"
extensions = ["myst_nb", "sphinx-mathjax-offline"]   # the package installs under this hyphenated name
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
nb_execution_mode = "off"               # papermill already ran every notebook
nb_merge_streams = True
nb_output_stderr = "remove"          # progress bars and warnings: noise in a book
exclude_patterns = ["_build", "**.ipynb_checkpoints", "docs/README.md"]
suppress_warnings = ["mystnb.unknown_mime_type"]
html_theme = "sphinx_book_theme"
html_title = "speclib: a workbook on speculative decoding"
html_theme_options = {"show_toc_level": 2, "use_download_button": False, "use_fullscreen_button": False}
html_static_path = []
html_copy_source = False
html_favicon = "favicon.svg"   # a page without one makes browsers ask the server for /favicon.ico (a 404)
