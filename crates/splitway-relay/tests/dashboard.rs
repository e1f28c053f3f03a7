//! The shipped Grafana dashboard parses and queries only metrics that
//! exist: those of the relay's whole registry, splitway-control's families
//! and the rooms' (`relay::metrics_with_rooms`, what `/metrics` serves).

#[test]
fn grafana_dashboard_uses_only_exported_metric_names() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana-splitway.json"
    );
    let text = std::fs::read_to_string(path).expect("deploy/grafana-splitway.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    );

    let (metrics, _rooms) = splitway_relay::relay::metrics_with_rooms(["rs"]);
    let exported = metrics.encode();
    let mut used = Vec::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("splitway_") {
        let name: String = rest[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[start + name.len()..];
        used.push(name);
    }
    used.sort();
    used.dedup();
    assert!(used.len() >= 10, "{used:?}");
    for name in &used {
        let series = format!("\n{name}{{");
        assert!(
            exported.contains(&series),
            "dashboard queries {name}, which /metrics does not export"
        );
    }
}
