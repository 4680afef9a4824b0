"""The browser page (index.html, app.js) and the search module it shares with the Node example
(search.js), shipped as package data so ``s2s-deploy web DIR`` can copy them beside an export."""
