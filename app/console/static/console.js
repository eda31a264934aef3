// The overview refreshes its live part every five seconds (the page works without this).
"use strict";
(function () {
  var live = document.getElementById("live");
  if (!live || !window.fetch) { return; }
  var url = live.getAttribute("data-refresh");
  function refresh() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (answer) {
        if (answer.redirected || !answer.ok) { return null; }
        return answer.text();
      })
      .then(function (html) { if (html !== null) { live.innerHTML = html; } })
      .catch(function () {})
      .then(function () { window.setTimeout(refresh, 5000); });
  }
  window.setTimeout(refresh, 5000);
})();
