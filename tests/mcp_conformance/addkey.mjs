// A client-side shim: the conformance runner sends no credentials; this adds a gateway key to
// every request and passes bytes both ways as they come.
import http from "node:http";
const [listen, target, key] = [Number(process.env.LISTEN), new URL(process.env.TARGET), process.env.KEY];
http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: `Bearer ${key}`, host: target.host };
  const up = http.request({ host: target.hostname, port: target.port, path: req.url, method: req.method, headers }, (r) => {
    res.writeHead(r.statusCode, r.headers);
    r.pipe(res);
  });
  up.on("error", () => { res.writeHead(502); res.end(); });
  req.pipe(up);
}).listen(listen);
