// Deck behaviour: keyboard navigation, deep links (#N or #slide-id), fitting each slide to the window,
// speaker notes, the presenter view (P or ?presenter: current slide, next slide, notes, clock; it
// follows and drives the audience window), feedback notes and text edits.
// Served by `glm53 serve`, notes and edits are stored on the server (with the page's token);
// opened from file://, they stay in this browser's localStorage.
(function () {
  "use strict";
  var slides = Array.prototype.slice.call(document.querySelectorAll(".slide"));
  var token = (document.querySelector('meta[name="glm53-token"]') || {}).content || "";
  var served = location.protocol.indexOf("http") === 0 && token && token.indexOf("__GLM53") !== 0;
  var STORE = "glm53-deck-v1:";
  var current = 0;
  var params = new URL(location.href).searchParams;
  var presenter = params.has("presenter");
  var started = Date.now();
  var channel = null;
  try { channel = new BroadcastChannel("glm53-deck"); } catch (e) { channel = null; }
  var MIN_FIT = 0.6;  // never shrink a slide's text below 60% of its size
  var feedback = load("feedback", {});
  var edits = load("text-edits", {});

  function load(name, fallback) {
    try { return JSON.parse(localStorage.getItem(STORE + name)) || fallback; } catch (e) { return fallback; }
  }
  function keep(name, value) {
    try { localStorage.setItem(STORE + name, JSON.stringify(value)); } catch (e) { /* private mode */ }
  }
  function post(path, body) {
    if (!served) { return Promise.resolve(null); }
    return fetch(path, { method: "POST", headers: { "Content-Type": "application/json", "X-GLM53-Token": token },
                         body: JSON.stringify(body) })
      .then(function (r) { if (!r.ok) { throw new Error(path + " answered " + r.status); } return r.json(); });
  }
  function status(text) { document.getElementById("feedback-status").textContent = text; }

  // Shrink the slide's text (not its charts) step by step until nothing overflows the window: neither
  // the slide nor its body (a flex item that may shrink below its content, which then runs under the
  // footer without making the slide scroll).
  function overflows(slide, body) {
    return slide.scrollHeight > slide.clientHeight + 1 || slide.scrollWidth > slide.clientWidth + 1 ||
           body.scrollHeight > body.clientHeight + 1;
  }
  function fit(slide) {
    var body = slide.querySelector(".body");
    var scale = 1;
    body.style.fontSize = "";
    while (overflows(slide, body) && scale > MIN_FIT) {
      scale = Math.round((scale - 0.04) * 100) / 100;
      body.style.fontSize = scale + "em";
    }
    slide.setAttribute("data-fit", String(scale));
  }

  function indexFromLocation() {
    var hash = decodeURIComponent(location.hash.replace(/^#/, ""));
    if (/^\d+$/.test(hash)) { return parseInt(hash, 10) - 1; }
    for (var i = 0; i < slides.length; i++) { if (hash && slides[i].id === hash) { return i; } }
    var n = parseInt(params.get("slide") || "1", 10) - 1;
    return isNaN(n) ? 0 : n;
  }

  function preview(target, index) {
    target.innerHTML = "";
    if (index >= slides.length) { target.textContent = "end of the deck"; return; }
    var copy = slides[index].cloneNode(true);
    copy.removeAttribute("id");
    copy.classList.add("active");
    var frame = document.createElement("div");
    frame.className = "frame";
    frame.appendChild(copy);
    target.appendChild(frame);
    var scale = target.clientWidth / 1280;
    frame.style.transform = "scale(" + scale + ")";
    target.style.height = (800 * scale) + "px";
    fit(copy);
  }

  function renderPresenter() {
    preview(document.getElementById("presenter-current"), current);
    preview(document.getElementById("presenter-next"), current + 1);
    document.getElementById("presenter-notes").textContent =
      slides[current].querySelector(".notes").textContent;
  }

  function tick() {
    var s = Math.floor((Date.now() - started) / 1000);
    document.getElementById("presenter-clock").textContent = (current + 1) + " / " + slides.length + "   " +
      Math.floor(s / 60) + ":" + ("0" + (s % 60)).slice(-2) + " elapsed";
  }

  function show(index, fromChannel) {
    current = Math.max(0, Math.min(slides.length - 1, index));
    slides.forEach(function (s, i) { s.classList.toggle("active", i === current); });
    document.getElementById("bar").style.width = (100 * (current + 1) / slides.length) + "%";
    document.getElementById("counter").textContent = (current + 1) + " / " + slides.length + "  " +
      slides[current].getAttribute("data-title");
    document.getElementById("feedback-text").value = feedback[slides[current].id] || "";
    if (presenter) { renderPresenter(); tick(); } else { fit(slides[current]); }
    if (location.hash !== "#" + (current + 1)) { history.replaceState(null, "", "#" + (current + 1)); }
    if (channel && !fromChannel) { channel.postMessage({ slide: current }); }
  }

  function catalog() {
    var out = {};
    slides.forEach(function (s, i) {
      if (feedback[s.id]) { out[s.id] = { title: s.getAttribute("data-title"), lastKnownPosition: i + 1, lastSeenAt: null }; }
    });
    return out;
  }
  var timer = null;
  function saveFeedback() {
    keep("feedback", feedback);
    clearTimeout(timer);
    timer = setTimeout(function () {
      post("/api/feedback", { feedback: feedback, catalog: catalog() })
        .then(function (doc) { status(doc ? "saved on the server" : "saved in this browser"); })
        .catch(function (e) { status("not saved on the server: " + e.message); });
    }, 250);
  }

  function applyEdits() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-edit]"), function (el) {
      var key = el.getAttribute("data-edit");
      if (!el.hasAttribute("data-original")) { el.setAttribute("data-original", el.textContent); }
      if (Object.prototype.hasOwnProperty.call(edits, key)) { el.textContent = edits[key]; }
    });
  }
  function startEdit(el) {
    var before = el.textContent;
    el.setAttribute("contenteditable", "true");
    el.focus();
    function finish(commit) {
      el.removeAttribute("contenteditable");
      el.removeEventListener("keydown", onKey);
      el.removeEventListener("blur", onBlur);
      if (!commit) { el.textContent = before; return; }
      edits[el.getAttribute("data-edit")] = el.textContent;
      keep("text-edits", edits);
      post("/api/text-edits", { edits: edits }).catch(function (e) { status("edit not saved on the server: " + e.message); });
    }
    function onKey(ev) {
      if (ev.key === "Enter") { ev.preventDefault(); finish(true); }
      if (ev.key === "Escape") { ev.preventDefault(); finish(false); }
      ev.stopPropagation();
    }
    function onBlur() { finish(true); }
    el.addEventListener("keydown", onKey);
    el.addEventListener("blur", onBlur);
  }

  document.addEventListener("keydown", function (ev) {
    if (ev.target && (ev.target.tagName === "TEXTAREA" || ev.target.isContentEditable)) { return; }
    if (["ArrowRight", "PageDown", " "].indexOf(ev.key) >= 0) { ev.preventDefault(); show(current + 1); }
    else if (["ArrowLeft", "PageUp"].indexOf(ev.key) >= 0) { ev.preventDefault(); show(current - 1); }
    else if (ev.key === "Home") { show(0); }
    else if (ev.key === "End") { show(slides.length - 1); }
    else if (ev.key === "s" || ev.key === "S") { document.body.classList.toggle("show-notes"); fit(slides[current]); }
    else if ((ev.key === "p" || ev.key === "P") && !presenter) { openPresenter(); }
    else if (ev.key === "f" || ev.key === "F") { togglePanel(); }
  });
  function togglePanel() { var p = document.getElementById("feedback"); p.hidden = !p.hidden; }
  function openPresenter() {
    var url = new URL(location.href);
    url.searchParams.set("presenter", "");
    url.hash = "#" + (current + 1);
    window.open(url.toString(), "glm53-presenter");
  }
  document.getElementById("toggle-notes").addEventListener("click", function () {
    document.body.classList.toggle("show-notes");
    fit(slides[current]);
  });
  document.getElementById("open-presenter").addEventListener("click", openPresenter);
  window.addEventListener("hashchange", function () { show(indexFromLocation()); });
  window.addEventListener("resize", function () { show(current, true); });
  if (channel) { channel.onmessage = function (ev) { if (ev.data && ev.data.slide !== current) { show(ev.data.slide, true); } }; }
  document.getElementById("toggle-feedback").addEventListener("click", togglePanel);
  document.getElementById("feedback-text").addEventListener("input", function (ev) {
    var id = slides[current].id;
    if (ev.target.value) { feedback[id] = ev.target.value; } else { delete feedback[id]; }
    saveFeedback();
  });
  document.addEventListener("dblclick", function (ev) {
    var el = ev.target.closest && ev.target.closest("[data-edit]");
    if (el) { startEdit(el); }
  });
  if (!served) { document.getElementById("playground-link").hidden = true; }

  if (presenter) {
    document.body.classList.add("presenter");
    document.getElementById("presenter").hidden = false;
    setInterval(tick, 1000);
  }
  // Each chart's share of a filled slide's height (slides.py's data-grow): set here, through the DOM,
  // because the page's content security policy allows no style attribute.
  Array.prototype.forEach.call(document.querySelectorAll("figure[data-grow]"), function (figure) {
    figure.style.flexGrow = figure.getAttribute("data-grow");
  });
  applyEdits();
  show(indexFromLocation());
  status(served ? "" : "opened as a file: notes stay in this browser");
  if (served) {
    // The server's copy wins over this browser's (another browser may have written since).
    Promise.all([fetch("/api/feedback").then(function (r) { return r.json(); }),
                 fetch("/api/text-edits").then(function (r) { return r.json(); })])
      .then(function (docs) {
        feedback = Object.assign({}, feedback, docs[0].feedback);
        edits = Object.assign({}, edits, docs[1].edits);
        keep("feedback", feedback); keep("text-edits", edits);
        applyEdits();
        show(current);
        document.body.setAttribute("data-notes-loaded", "true");
      })
      .catch(function (e) { status("server notes not loaded: " + e.message); });
  }
})();
