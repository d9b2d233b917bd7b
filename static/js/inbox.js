// The inbox: messages Sluice starts itself, live over /ws/inbox/ in every open tab (and the
// unread ones when a page opens). Announcements and "your answer is ready" appear as notes at
// the top of the page; suggested follow-up questions as chips under the answer they follow,
// which send the question when clicked. A message is marked read once a visible page showed
// it. Every text is inserted with textContent: nothing here is HTML.
(function () {
  "use strict";
  if (!window.WebSocket) return;

  const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws/inbox/";
  const composer = document.getElementById("composer");
  const match = composer && /\/chat\/(\d+)\//.exec(composer.dataset.wsPath || "");
  const conversationId = match ? Number(match[1]) : null;
  const seen = new Set(); // ids handled already (a reconnect may hand them again)
  let toRead = []; // shown, to be marked read while the page is visible
  let socket = null;
  // Backs off as chat.js does: a socket told "try again later" (4503 or 1013) keeps backing
  // off even though it opened; the chat socket of the same page shows why.
  const FIRST_RETRY = 1000;
  const TRY_AGAIN_LATER = [4503, 1013];
  let retryDelay = FIRST_RETRY;

  let notes = null;
  function noteArea() {
    if (!notes) {
      notes = document.createElement("div");
      notes.className = "inbox-notes";
      notes.setAttribute("role", "status");
      notes.setAttribute("aria-live", "polite");
      const main = document.querySelector("main") || document.body;
      main.insertBefore(notes, main.firstChild);
    }
    return notes;
  }

  function showNote(message, link) {
    const note = document.createElement("div");
    note.className = "inbox-note " + message.kind;
    note.dataset.inboxId = message.id;
    const text = document.createElement("span");
    text.textContent = message.text;
    note.appendChild(text);
    if (link) {
      const a = document.createElement("a");
      a.href = link;
      a.textContent = "Open";
      note.appendChild(a);
    }
    const close = document.createElement("button");
    close.type = "button";
    close.className = "link inbox-dismiss";
    close.setAttribute("aria-label", "Dismiss");
    close.textContent = "×";
    close.addEventListener("click", function () { note.remove(); });
    note.appendChild(close);
    noteArea().appendChild(note);
  }

  function lastAnswer() {
    const answers = document.querySelectorAll("#message-list .message.assistant:not(.pending)");
    return answers.length ? answers[answers.length - 1] : null;
  }

  function answerFor(data) {
    const list = document.getElementById("message-list");
    if (!list) return null;
    if (data.message_id) {
      const li = list.querySelector('li.message[data-message-id="' + Number(data.message_id) + '"]');
      if (li) return li;
    }
    if (data.request_id && /^[\w-]+$/.test(String(data.request_id))) {
      return list.querySelector('li.message[data-request-id="' + data.request_id + '"]');
    }
    return null;
  }

  function sendQuestion(question) {
    const textarea = composer && composer.querySelector("textarea");
    if (!textarea) return;
    textarea.value = question;
    composer.requestSubmit(); // chat.js sends it over its socket (or the form posts)
  }

  function showFollowups(li, questions) {
    const old = document.querySelector(".followups");
    if (old) old.remove(); // only the latest answer offers follow-ups
    const box = document.createElement("div");
    box.className = "followups";
    box.setAttribute("aria-label", "Suggested follow-up questions");
    questions.slice(0, 3).forEach(function (question) {
      if (typeof question !== "string" || !question.trim()) return;
      const chip = document.createElement("button");
      chip.type = "button";
      chip.className = "followup-chip";
      chip.textContent = question;
      chip.addEventListener("click", function () {
        box.remove();
        sendQuestion(question);
      });
      box.appendChild(chip);
    });
    if (box.childElementCount) li.appendChild(box);
  }

  // Returns whether the message was shown (or needs no showing here), so it can be marked read.
  const handlers = {
    announcement(message) {
      showNote(message, null);
      return true;
    },
    answer_ready(message) {
      const data = message.data || {};
      const here = conversationId !== null && data.conversation_id === conversationId;
      if (!(here && document.visibilityState === "visible")) showNote(message, here ? null : data.url);
      return true;
    },
    followups(message) {
      const data = message.data || {};
      const li = answerFor(data);
      if (!li) return false; // its answer is not on this page: kept for the page that shows it
      if (li === lastAnswer() && Array.isArray(data.questions)) showFollowups(li, data.questions);
      return true; // shown, or stale (a later answer came since)
    },
  };

  function handle(message) {
    if (seen.has(message.id)) return;
    const handler = handlers[message.kind];
    if (!handler) return;
    seen.add(message.id);
    if (handler(message)) toRead.push(message.id);
    else seen.delete(message.id); // not shown here: a later page (or reconnect) shows it
    flushRead();
  }

  function flushRead() {
    if (!toRead.length || document.visibilityState !== "visible") return;
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    socket.send(JSON.stringify({ type: "read", ids: toRead }));
    toRead = [];
  }

  function connect() {
    socket = new WebSocket(url);
    let opened = false;
    socket.addEventListener("open", function () {
      opened = true;
      flushRead();
    });
    socket.addEventListener("message", function (event) {
      let frame;
      try { frame = JSON.parse(event.data); } catch (e) { return; }
      if (frame.type === "inbox" && Array.isArray(frame.messages)) frame.messages.forEach(handle);
    });
    socket.addEventListener("close", function (event) {
      if (event.code === 4401) return; // logged out: nothing more to receive
      if (opened && TRY_AGAIN_LATER.indexOf(event.code) < 0) retryDelay = FIRST_RETRY;
      setTimeout(connect, retryDelay * (0.5 + Math.random() / 2)); // spread out, as in chat.js
      retryDelay = Math.min(retryDelay * 2, 30000);
    });
  }

  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState !== "visible") return;
    flushRead();
  });
  connect();
})();
