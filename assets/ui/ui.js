// The status page of `zkguard serve` (GET /ui): refreshes the live part every second and runs
// the actions (replay a dead letter or all of them, discard one, clear a stray mutex,
// force-release an explicit lock; the ones that cannot be undone after a confirmation) through
// the /v1 API. The bearer token
// is typed into the page and kept in this tab's sessionStorage; it is sent in the Authorization
// header only, never in a cookie. Everything shown comes from the server, HTML-escaped.
(function () {
  'use strict';
  var status = document.getElementById('status');
  var message = document.getElementById('message');
  var live = document.getElementById('live');
  var tokenField = document.getElementById('token');
  var KEY = 'zkguard-token';
  var pressed = false;
  var loading = false;

  if (tokenField) {
    tokenField.value = sessionStorage.getItem(KEY) || '';
    tokenField.addEventListener('input', function () {
      sessionStorage.setItem(KEY, tokenField.value.trim());
    });
  }

  function say(text, ok) {
    message.textContent = text;
    message.className = ok ? 'ok' : 'error';
  }

  function refresh() {
    // Not while a button is pressed (the click would be lost with the button replaced), nor
    // while the tab is hidden, nor while the previous refresh is under way.
    if (pressed || loading || document.hidden) {
      return;
    }
    loading = true;
    fetch('ui/status' + location.search, { cache: 'no-store', credentials: 'omit' })
      .then(function (r) {
        if (!r.ok) {
          throw new Error('the service answered ' + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        if (!pressed) {
          status.innerHTML = html;
        }
        live.textContent = 'Updated every second.';
        live.className = 'muted';
      })
      .catch(function (e) {
        live.textContent = 'Not updated: ' + e.message + '; retrying.';
        live.className = 'bad';
      })
      .then(function () {
        loading = false;
      });
  }

  function describe(action, code, body, id) {
    if (code === 401) {
      return 'Refused (401): ' + (body.message || 'a bearer token is needed') +
        ' Type the token in the field above.';
    }
    if (code !== 200) {
      return 'Refused (' + code + ' ' + (body.error || '') + '): ' + (body.message || '');
    }
    if (action === 'replay-all') {
      var counts = ['applied', 'already_applied', 'still_parked', 'not_removed', 'superseded']
        .filter(function (k) { return body[k]; })
        .map(function (k) { return body[k] + ' ' + k.replace(/_/g, ' '); });
      return 'Replayed ' + (body.replayed || 0) + ' dead letter' + (body.replayed === 1 ? '' : 's') +
        (counts.length ? ': ' + counts.join(', ') : '') + '.';
    }
    if (action === 'discard') {
      return 'Discarded ' + body.id + ' (' + body.summary + '): its operation is rejected.';
    }
    if (action === 'force-release') {
      return 'Force-released lock ' + body.lock_id + ' on ' + body.monitor + ' (token ' + body.token +
        '): its holder\'s next call with it is refused.';
    }
    if (action === 'replay') {
      // The older entries of the same document are replayed first: say how they went too.
      var results = body.results || [];
      var r = results.filter(function (x) { return x.id === id; })[0] || results[results.length - 1] || {};
      var older = results.filter(function (x) { return x.id !== r.id; });
      var first = older.length === 0 ? '' : ' (after ' + older.length +
        ' older entr' + (older.length === 1 ? 'y' : 'ies') + ' of its document: ' +
        older.map(function (x) { return String(x.result).replace(/_/g, ' '); }).join(', ') + ')';
      return 'Replayed ' + (r.id || '') + ': ' + String(r.result || 'done').replace(/_/g, ' ') +
        (r.token !== undefined ? ' (token ' + r.token + ')' : '') +
        (r.error ? ': ' + r.error : '') + first + '.';
    }
    return 'Stray mutex of ' + body.monitor + ': ' + String(body.outcome).replace(/_/g, ' ') + '.';
  }

  // The request of `action` on `button`, or null when the operator did not confirm it.
  function request(action, button) {
    var id = button.getAttribute('data-id');
    var monitor = button.getAttribute('data-monitor');
    if (action === 'replay') {
      return { method: 'POST', url: 'v1/deadletters/replay', body: JSON.stringify({ id: id }) };
    }
    if (action === 'clear-stray') {
      return { method: 'POST', url: 'v1/locks/' + encodeURIComponent(monitor) + '/clear-stray' };
    }
    if (action === 'replay-all') {
      var n = button.getAttribute('data-count');
      if (!window.confirm('Replay all ' + n + ' dead letters? Each runs again under its lock, ' +
          'oldest first; those that fail again stay parked.')) {
        return null;
      }
      return { method: 'POST', url: 'v1/deadletters/replay', body: JSON.stringify({ all: true }) };
    }
    if (action === 'discard') {
      if (!window.confirm('Discard dead letter ' + id + ' (' + button.getAttribute('data-summary') +
          ')? It is removed for good without being written; its operation becomes rejected.')) {
        return null;
      }
      return {
        method: 'DELETE',
        url: 'v1/deadletters/' + encodeURIComponent(id) + '?reason=' +
          encodeURIComponent('discarded from the status page')
      };
    }
    if (action === 'force-release') {
      var lock = button.getAttribute('data-lock-id');
      var reason = window.prompt('Force-release lock ' + lock + ' on ' + monitor + '? Its holder ' +
        'loses it: its next write, keep-alive or release with it is refused. Reason (for the log):', '');
      if (reason === null) {
        return null;
      }
      return {
        method: 'POST',
        url: 'v1/locks/' + encodeURIComponent(monitor) + '/' + encodeURIComponent(lock) +
          '/force-release' + (reason.trim() ? '?reason=' + encodeURIComponent(reason.trim()) : '')
      };
    }
    return null;
  }

  function act(button) {
    var action = button.getAttribute('data-action');
    var asked = request(action, button);
    if (!asked) {
      pressed = false;
      return;
    }
    var headers = { 'Content-Type': 'application/json' };
    var token = tokenField ? tokenField.value.trim() : '';
    if (token) {
      headers.Authorization = 'Bearer ' + token;
    }
    button.disabled = true;
    say('Working…', true);
    fetch(asked.url, {
      method: asked.method, headers: headers, body: asked.body, credentials: 'omit', cache: 'no-store'
    })
      .then(function (r) {
        return r.text().then(function (text) {
          var parsed = {};
          try { parsed = JSON.parse(text); } catch (e) { parsed = { message: text }; }
          say(describe(action, r.status, parsed, button.getAttribute('data-id')), r.status === 200);
        });
      })
      .catch(function (e) {
        say('The request failed: ' + e.message, false);
      })
      .then(function () {
        button.disabled = false;
        pressed = false;
        refresh();
      });
  }

  status.addEventListener('pointerdown', function () { pressed = true; });
  document.addEventListener('pointerup', function () {
    setTimeout(function () { pressed = false; }, 0);
  });
  status.addEventListener('click', function (e) {
    var button = e.target.closest('button[data-action]');
    if (button) {
      act(button);
    }
  });
  document.addEventListener('visibilitychange', refresh);
  setInterval(refresh, 1000);
}());
