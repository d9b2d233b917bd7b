// The chat page's live half: sends over the websocket, shows queue state and tokens as they
// arrive, Stop and Regenerate, and reconnects (the server resumes the answer in progress).
// Model text is only ever inserted with textContent; the final answer's HTML comes from the
// server, rendered from Markdown and sanitised there.
(function () {
  "use strict";
  const form = document.getElementById("composer");
  if (!form || !window.WebSocket) return;

  const list = document.getElementById("message-list");
  const textarea = form.querySelector("textarea");
  const sendButton = document.getElementById("send-button");
  const stopButton = document.getElementById("stop-button");
  const regenerateButton = document.getElementById("regenerate-button");
  const errorBox = document.getElementById("composer-error");
  const connectionState = document.getElementById("connection-state");
  const wsBase = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + form.dataset.wsPath;

  // On a reconnect the socket names the answer it was following and the last event it saw, so
  // the server continues from there instead of replaying the answer from its start.
  function wsUrl() {
    if (!current) return wsBase;
    return wsBase + "?resume=" + encodeURIComponent(current.requestId) +
      "&after=" + encodeURIComponent(current.lastEventId);
  }

  let socket = null;
  // Reconnects back off from FIRST_RETRY to 10 s. A socket that opens only to be told "try
  // again later" (4503, or the standard 1013: the server cannot reach its database or queue
  // right now) keeps backing off; any other socket that opened starts again from FIRST_RETRY.
  const FIRST_RETRY = 500;
  const TRY_AGAIN_LATER = [4503, 1013];
  let retryDelay = FIRST_RETRY;
  let unavailable = ""; // why the server said to try again later, from its "unavailable" frame
  let current = null; // {requestId, li, textEl, statusEl, lastEventId}

  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = !message;
  }

  function setBusy(busy) {
    sendButton.disabled = busy;
    stopButton.hidden = !busy;
    regenerateButton.hidden = busy || !list.querySelector(".message.assistant:not(.pending)");
  }

  function scrollToEnd() {
    // tools.js follows the answer only while the reader is at the bottom.
    if (window.sluiceFollow) window.sluiceFollow();
    else list.scrollTop = list.scrollHeight;
  }

  function dropEmptyPlaceholder() {
    const empty = list.querySelector("li.empty");
    if (empty) empty.remove();
  }

  function assistantBubble(requestId) {
    let li = list.querySelector('li.pending[data-request-id="' + requestId + '"]');
    if (!li) {
      dropEmptyPlaceholder();
      li = document.createElement("li");
      li.className = "message assistant pending";
      li.dataset.requestId = requestId;
      li.innerHTML = '<div class="role">Sluice</div><div class="text"></div><p class="status"></p>';
      list.appendChild(li);
    }
    const noscript = li.querySelector("noscript");
    if (noscript) noscript.remove();
    current = {
      requestId: requestId,
      li: li,
      textEl: li.querySelector(".text"),
      statusEl: li.querySelector(".status"),
      lastEventId: "0",
    };
    setBusy(true);
    return current;
  }

  function statusText(frame) {
    if (frame.state === "queued" && frame.position) {
      const eta = frame.eta_seconds ? " (about " + Math.max(1, Math.round(+frame.eta_seconds)) + " s)" : "";
      // reason: the plan's rate holds the request (set by the dispatcher), said beside the line.
      return "You are #" + frame.position + " in line" + eta + "." + (frame.reason ? " " + frame.reason : "");
    }
    if (frame.state === "queued") return "Waiting for a free worker…";
    if (frame.state === "dispatched") return "Starting…";
    return "";
  }

  // The sources under an answer, built as text nodes (titles and snippets are documents' text).
  function citationList(citations) {
    const aside = document.createElement("aside");
    aside.className = "citations";
    aside.setAttribute("aria-label", "Sources");
    const heading = document.createElement("div");
    heading.className = "muted";
    heading.textContent = "Sources";
    const list = document.createElement("ol");
    list.className = "citation-list";
    citations.forEach(function (c) {
      const li = document.createElement("li");
      const link = document.createElement("a");
      link.href = c.source_url;
      link.textContent = "[" + c.number + "] " + c.title;
      li.appendChild(link);
      if (c.snippet) {
        const snippet = document.createElement("div");
        snippet.className = "muted";
        snippet.textContent = c.snippet;
        li.appendChild(snippet);
      }
      list.appendChild(li);
    });
    aside.appendChild(heading);
    aside.appendChild(list);
    return aside;
  }

  // A note above the answer that stays after it ends: retrieval was unavailable, so the answer
  // goes on without the documents' passages. Text only.
  function showNotice(li, text) {
    let note = li.querySelector(".answer-notice");
    if (!note) {
      note = document.createElement("p");
      note.className = "answer-notice muted";
      note.setAttribute("role", "status");
      li.insertBefore(note, li.querySelector(".text"));
    }
    note.textContent = text;
  }

  const handlers = {
    user_message(frame) {
      dropEmptyPlaceholder();
      const li = document.createElement("li");
      li.className = "message user";
      li.dataset.messageId = frame.id;
      li.innerHTML = '<div class="role">You</div><div class="text"></div>';
      li.querySelector(".text").innerHTML = frame.html; // escaped by the server
      list.appendChild(li);
      scrollToEnd();
    },
    regenerating() {
      const answers = list.querySelectorAll(".message.assistant:not(.pending)");
      if (answers.length) answers[answers.length - 1].remove();
    },
    request(frame) {
      assistantBubble(frame.request_id);
      current.statusEl.textContent = "Queued…";
    },
    status(frame) {
      const c = current && current.requestId === frame.request_id ? current : assistantBubble(frame.request_id);
      if (frame.citations) c.citations = frame.citations;
      if (frame.notice) showNotice(c.li, frame.notice);
      c.statusEl.textContent = statusText(frame);
    },
    start(frame) {
      const c = current && current.requestId === frame.request_id ? current : assistantBubble(frame.request_id);
      c.textEl.textContent = ""; // a new attempt replays the answer from its start
      c.statusEl.textContent = "";
    },
    delta(frame) {
      const c = current && current.requestId === frame.request_id ? current : assistantBubble(frame.request_id);
      c.textEl.appendChild(document.createTextNode(frame.text));
      c.statusEl.textContent = "";
      scrollToEnd();
    },
    final(frame) {
      const c = current && current.requestId === frame.request_id ? current : assistantBubble(frame.request_id);
      c.li.classList.remove("pending");
      c.textEl.innerHTML = frame.html; // sanitised Markdown from the server
      if (frame.state === "cancelled") c.statusEl.textContent = "Stopped.";
      else if (frame.state === "failed") c.statusEl.textContent = frame.error || "The answer failed.";
      else c.statusEl.remove();
      if (c.citations && c.citations.length && frame.state !== "cancelled") c.li.appendChild(citationList(c.citations));
      current = null;
      setBusy(false);
      scrollToEnd();
    },
    error(frame) {
      showError(frame.message);
      if (frame.draft && !textarea.value) textarea.value = frame.draft; // nothing typed is lost
      if (!current) setBusy(false);
    },
  };

  // Stream entry ids are "<ms>-<seq>": compared as numbers, part by part.
  function isNewer(id, last) {
    const a = id.split("-").map(Number), b = last.split("-").map(Number);
    return a[0] > b[0] || (a[0] === b[0] && (a[1] || 0) > (b[1] || 0));
  }

  function connect() {
    socket = new WebSocket(wsUrl());
    let opened = false;
    unavailable = "";
    socket.addEventListener("open", function () {
      opened = true;
      connectionState.hidden = true;
      // The answer may have ended while we were away (then the server follows nothing):
      // ask for it from the last event seen. Frames seen already are skipped below.
      if (current) socket.send(JSON.stringify({ type: "resume", request_id: current.requestId, last_event_id: current.lastEventId }));
    });
    socket.addEventListener("message", function (event) {
      let frame;
      try { frame = JSON.parse(event.data); } catch (e) { return; }
      if (frame.type === "unavailable") { unavailable = frame.message || ""; return; }
      if (frame.event_id && current && frame.request_id === current.requestId) {
        if (!isNewer(frame.event_id, current.lastEventId)) return; // shown already
        current.lastEventId = frame.event_id;
      }
      const handler = handlers[frame.type];
      if (handler) handler(frame);
      document.dispatchEvent(new CustomEvent("sluice:frame", { detail: frame })); // tools.js
    });
    socket.addEventListener("close", function (event) {
      if (event.code === 4401 || event.code === 4404) {
        connectionState.textContent = "Please log in again.";
        connectionState.hidden = false;
        return;
      }
      // A random share of the delay: the pages of a web process that went away do not all
      // come back to the others in the same instant.
      const refused = TRY_AGAIN_LATER.indexOf(event.code) >= 0;
      if (opened && !refused) retryDelay = FIRST_RETRY;
      const wait = retryDelay * (0.5 + Math.random() / 2);
      retryDelay = Math.min(retryDelay * 2, 10000);
      if (refused) {
        const why = unavailable || event.reason || "Sluice is unavailable right now.";
        connectionState.textContent = why + " Trying again in " + Math.ceil(wait / 1000) + " s…";
      } else {
        connectionState.textContent = "Reconnecting…";
      }
      connectionState.hidden = false;
      setTimeout(connect, wait);
    });
  }

  form.addEventListener("submit", function (event) {
    if (!socket || socket.readyState !== WebSocket.OPEN) return; // plain form post instead
    event.preventDefault();
    const text = textarea.value.trim();
    if (!text) { showError("Type a message first."); return; }
    showError("");
    socket.send(JSON.stringify({ type: "send", text: text }));
    textarea.value = "";
  });
  textarea.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  stopButton.addEventListener("click", function () {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "stop", request_id: current ? current.requestId : null }));
    }
  });
  regenerateButton.addEventListener("click", function () {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "regenerate" }));
  });

  // For tools.js (edit a sent message): a frame over this socket; false while it is closed.
  window.sluiceChat = {
    open() { return !!socket && socket.readyState === WebSocket.OPEN; },
    send(frame) {
      if (!socket || socket.readyState !== WebSocket.OPEN) return false;
      socket.send(JSON.stringify(frame));
      return true;
    },
  };

  const pending = list.querySelector("li.pending[data-request-id]");
  if (pending) assistantBubble(pending.dataset.requestId);
  else setBusy(false);
  scrollToEnd();
  connect();
})();

// The model picker: a pick applies at once (the page reloads with the conversation's new
// model); without JavaScript its "Use" button does the same.
(function () {
  "use strict";
  const picker = document.getElementById("model-picker");
  if (!picker) return;
  const apply = picker.querySelector("button");
  if (apply) apply.hidden = true;
  picker.querySelector("select").addEventListener("change", function () {
    picker.submit();
  });
})();
