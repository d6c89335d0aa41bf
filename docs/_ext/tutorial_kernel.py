"""Run in each tutorial's kernel before its first cell when ``make docs`` executes the notebooks
(``nbsphinx_execute_arguments`` in ``docs/conf.py``).

- The kernel works in a fresh temporary folder, as the acceptance tests run the notebooks: what a
  notebook writes does not land among the site's sources (``docs/tutorials``).
- Plotly figures render as HTML that loads plotly.js from the site itself
  (``_static/plotly.min.js``, copied there by ``mi_core_docs``), without MathJax: the default
  renderers inside a kernel emit only plotly's JSON mimetype (which a static page cannot show)
  or load plotly.js and MathJax from a CDN.
"""

import os
import tempfile

os.chdir(tempfile.mkdtemp(prefix="mi_core_tutorial_"))

try:
    import plotly.io as _pio
    from plotly.io._base_renderers import MimetypeRenderer as _MimetypeRenderer
except ImportError:  # no plotly: nothing to set up
    pass
else:

    class _SiteRenderer(_MimetypeRenderer):
        """HTML of a figure for a page of the site one folder below its root."""

        loaded = False  # whether a figure on this page already included plotly.js

        def to_mimebundle(self, fig_dict):
            include = False if _SiteRenderer.loaded else "../_static/plotly.min.js"
            _SiteRenderer.loaded = True
            html = _pio.to_html(
                fig_dict,
                include_plotlyjs=include,
                include_mathjax=False,
                full_html=False,
                default_width="100%",
                default_height=525,
                validate=False,
            )
            return {"text/html": html}

    _pio.renderers["mi_core_site"] = _SiteRenderer()
    _pio.renderers.default = "mi_core_site"
