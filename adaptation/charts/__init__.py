"""Every chart day0 draws, as plotly figures embedded in pages as JSON: one module per page
(its figures), `layout` the look they share.

Pages render them with plotly.js served from the plotly package (`static/charts.js` only hands
each embedded figure to `Plotly.newPlot`); no chart is drawn by hand-written JS. A chart's
words (titles, axis titles, trace names, hovers) are written here, since plotly draws them
from the figure; the words around a chart are in its page's template.
"""
