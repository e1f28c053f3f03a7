//! A real nginx in the server namespace, for tests with third-party clients.

use std::process::Stdio;
use std::time::Duration;

use super::*;

/// Starts nginx in the server namespace serving `dir/www` on port 80.
pub fn start_nginx(lab: &mut Lab) {
    start_nginx_with(
        lab,
        "'$remote_addr $status $body_bytes_sent'",
        &format!("listen {SERVER_V4}:80;\n"),
    );
}

/// Starts nginx in the server namespace serving `dir/www`, with `listens`
/// (`listen` directives, all on port 80) and access log `log_format`
/// (written to `dir/nginx-access.log`); returns once port 80 listens.
pub fn start_nginx_with(lab: &mut Lab, log_format: &str, listens: &str) {
    let base = lab.dir.path().to_path_buf();
    for sub in ["www", "nginx-tmp"] {
        std::fs::create_dir_all(base.join(sub)).expect("create nginx dir");
    }
    let b = base.display();
    let conf = format!(
        "daemon off;\n\
         master_process off;\n\
         worker_processes 1;\n\
         pid {b}/nginx.pid;\n\
         error_log {b}/nginx-error.log;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n\
           log_format access {log_format};\n\
           access_log {b}/nginx-access.log access;\n\
           client_body_temp_path {b}/nginx-tmp/body;\n\
           proxy_temp_path {b}/nginx-tmp/proxy;\n\
           fastcgi_temp_path {b}/nginx-tmp/fastcgi;\n\
           uwsgi_temp_path {b}/nginx-tmp/uwsgi;\n\
           scgi_temp_path {b}/nginx-tmp/scgi;\n\
           server {{\n\
             {listens}\
             root {b}/www;\n\
           }}\n\
         }}\n"
    );
    let conf_path = base.join("nginx.conf");
    std::fs::write(&conf_path, conf).expect("write nginx.conf");
    let args = [
        "-e".to_string(),
        format!("{b}/nginx-error.log"),
        "-p".to_string(),
        b.to_string(),
        "-c".to_string(),
        conf_path.display().to_string(),
    ];
    let check = output(lab.server.command("nginx").arg("-t").args(&args));
    assert!(
        check.status.success(),
        "nginx -t failed: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let child = lab
        .server
        .command("nginx")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nginx");
    lab.adopt(child);
    let server = &lab.server;
    wait_until(
        Deadline::after(Duration::from_secs(10)),
        "waiting for nginx to listen",
        || listening_ports(server).is_superset_of(&[80]).then_some(()),
    );
}

pub fn nginx_is_installed() -> bool {
    let found = std::process::Command::new("nginx")
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        if std::env::var("SPLITWAY_REQUIRE_NETNS").as_deref() == Ok("1") {
            panic!("nginx is not installed (apt-get install nginx-light)");
        }
        eprintln!("skipping: nginx is not installed");
    }
    found
}
