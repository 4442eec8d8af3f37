// Hands each figure built by adaptation/charts/ to plotly.js: the JSON in
// <script id="NAME-figure"> is drawn into the element id="NAME-chart", on load and after htmx swaps.
(function () {
  function render(root) {
    root.querySelectorAll('script[type="application/json"][id$="-figure"]').forEach(function (node) {
      var target = document.getElementById(node.id.replace(/-figure$/, "-chart"));
      if (!target || !window.Plotly) return;
      var figure = JSON.parse(node.textContent);
      Plotly.react(target, figure.data, figure.layout, {responsive: true, displaylogo: false});
    });
  }
  document.addEventListener("DOMContentLoaded", function () { render(document); });
  document.addEventListener("htmx:afterSettle", function (event) { render(event.target); });
})();
